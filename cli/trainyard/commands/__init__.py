"""The ``trainyard`` commands: ``commands/<name>.py`` defines the top-level
command or group ``trainyard <name>`` (an ``_`` of the module's name is a
``-`` of the command's: ``ssh_key.py`` is ``trainyard ssh-key``) and all of
its subcommands, as a click command named as the module (``trainyard.cli``
gathers them under one group).

Four modules define no command; the commands share them and nothing else:
``common`` (the error a command raises, the API client, following a run,
listing as a table or ``--json``, messages), ``options`` (the options
several commands take, each with one meaning: ``--region`` and
``--backend`` are documented there), ``submission`` (the plan-and-submit
sequence of ``run``, ``rerun`` and ``env build``) and ``completers`` (what
an argument completes to on Tab: runs, tags, workflows, environments). A
command module imports no other command module.
"""

SHARED = ("common", "completers", "options", "submission")
