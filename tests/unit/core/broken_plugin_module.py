"""A plugin module that fails at import, as a broken third-party plugin would."""

raise ImportError("libwidget.so.3: cannot open shared object file")
