"""The training lane of tests/train: a module here holds the tests that train a real model of
the module of the same name in tests/train, if there is one."""
