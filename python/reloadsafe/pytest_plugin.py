"""pytest plugin of reloadsafe (entry point ``pytest11``): the ``reload_check``
fixture. Loaded automatically once reloadsafe is installed (or its package
folder is on PYTHONPATH with its dist-info); ``-p no:reloadsafe.pytest_plugin``
turns it off."""
