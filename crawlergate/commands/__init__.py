"""The ``crawlergate`` sub-commands, one module per family; ``crawlergate.cli`` holds the top parser."""
