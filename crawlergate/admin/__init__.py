"""The admin endpoints under /_crawlergate/."""
