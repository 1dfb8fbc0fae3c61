"""The demo: a dynamic forum to protect and measure against, and a synthetic access-log generator."""
