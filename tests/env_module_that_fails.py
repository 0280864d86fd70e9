"""A user's env module whose own code fails as it is imported (``--env
tests.env_module_that_fails:Broken-v0``): the run says so in one line."""

raise RuntimeError("the module's own setup failed")
