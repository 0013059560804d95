# pytester runs the reload_check fixture's failure in a child pytest session
# (test_plugin.py).
pytest_plugins = ["pytester"]
