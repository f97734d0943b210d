"""The ``agentledger`` command.

Each command imports what it runs when it is named (``cli/_main.py``). Its workers run
the kernel with the features a production worker needs, registered by importing
``cli/_features.py`` where a command runs steps or prunes.
"""
