"""The training lane of the tests in tests/ itself (a real model trained for steps): a module
here holds those of the module of the same name up there, if there is one."""
