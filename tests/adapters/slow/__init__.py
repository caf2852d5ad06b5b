"""The slow lane of tests/adapters: a module here holds the slow tests of the module of the same
name in tests/adapters, if there is one."""
