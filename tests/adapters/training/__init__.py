"""The training lane of tests/adapters: a module here holds the tests that train a real model of
the module of the same name in tests/adapters, if there is one."""
