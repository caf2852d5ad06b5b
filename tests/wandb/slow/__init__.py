"""The slow lane of tests/wandb: a module here holds the slow tests of the module of the same
name in tests/wandb, if there is one."""
