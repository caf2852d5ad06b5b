"""The training lane of tests/wandb: a module here holds the tests that train a real model of
the module of the same name in tests/wandb, if there is one."""
