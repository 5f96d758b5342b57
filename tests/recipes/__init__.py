"""The recipes of docs/usage.md as files, each equal to its block there (tests/test_recipes.py)."""
