"""The slow lane of tests/hosted_tinker: a module here holds the slow tests of the
module of the same name in tests/hosted_tinker, if there is one."""
