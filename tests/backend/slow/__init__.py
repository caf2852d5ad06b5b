"""The slow lane of tests/backend: a module here holds the slow tests of the module of the same
name in tests/backend, if there is one."""
