"""The ``trainyard`` commands: ``commands/<name>.py`` defines the top-level
command or group ``trainyard <name>`` and all of its subcommands, as a click
command of the same name (``trainyard.cli`` gathers them under one group).

Three modules define no command; the commands share them and nothing else:
``common`` (the error a command raises, the API client, following a run,
listing as a table or ``--json``, messages), ``options`` (the options
several commands take, each with one meaning: ``--region`` and
``--backend`` are documented there) and ``submission`` (the plan-and-submit
sequence of ``run``, ``rerun`` and ``env build``). A command module imports
no other command module.
"""

SHARED = ("common", "options", "submission")
