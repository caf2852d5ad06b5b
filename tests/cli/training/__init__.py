"""The training lane of tests/cli: a module here holds the tests that train a real model of
the module of the same name in tests/cli, if there is one."""
