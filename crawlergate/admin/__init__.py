"""The admin endpoints under /_crawlergate/, the dashboard, and the figures they report."""
