"""Where the ``:name`` placeholders of a shared statement are, for every dialect.

Store SQL is written once with ``:name`` placeholders (see :mod:`agentledger.store._tx`);
each dialect rewrites a text once into what its driver binds cheapest (psycopg:
``%(name)s``; SQLite: numbered ``?N`` bound from a tuple). Both find the placeholders
with :data:`TOKENS`, so a statement means the same on both databases: nothing inside a
string literal, a quoted identifier or a comment is a placeholder, nor a ``::`` cast.
"""

from __future__ import annotations

import re

TOKENS = re.compile(
    r"""
      '(?:[^']|'')*'            # a string literal
    | "(?:[^"]|"")*"            # a quoted identifier
    | --[^\n]*                  # a line comment
    | /\*.*?\*/                 # a block comment
    | ::                        # a cast, not a placeholder
    | :(?P<name>[A-Za-z_]\w*)   # a placeholder
    | %                         # psycopg's own placeholder marker
    """,
    re.VERBOSE | re.DOTALL,
)
"""The lexical parts of a statement that matter to its placeholders: a match with a
``name`` group is a placeholder; any other match is text to keep as it is (a dialect
may escape it: psycopg's ``%``)."""
