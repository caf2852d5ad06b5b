"""The slow lane of tests/cli: a module here holds the slow tests of the module of the same
name in tests/cli, if there is one."""
