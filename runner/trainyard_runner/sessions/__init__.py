"""Getting into a running job: SSH (``ssh.py``) and a raw terminal
(``terminal.py``) served on a socket the relay hands over, with processes
started as the job's user in the job's directory and environment
(``context.py``, ``launch.py``)."""
