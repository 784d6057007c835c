"""A plugin module that raises while being imported (the fault tests select it via plugins.toml)."""

raise ImportError("this plugin's native library is missing (raised on purpose by the fault tests)")
