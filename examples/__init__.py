"""Sites in real frameworks with crawlergate mounted in them; tested by tests/test_examples.py."""
