"""The training lane of tests/hosted_tinker: a module here holds the tests that train a real
model of the module of the same name in tests/hosted_tinker, if there is one."""
