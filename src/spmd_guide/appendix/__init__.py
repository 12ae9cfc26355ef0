"""The appendices (book/appendix/).

- `api_changes`: old spellings and what they are in the installed JAX, from
  `api_changes.toml` (appendix/api_changes, appendix/coming_from_notebooks).
"""
