"""The slow lane of the tests in tests/ itself (more than ~2.5 s each on a loaded 2-core
machine): a module here holds those of the module of the same name up there, if there is one."""
