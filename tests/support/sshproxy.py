"""ProxyCommand of the SSH tests: ``python sshproxy.py SOCKET`` joins its
stdin and stdout to a unix socket (``sshbridge.bridge``)."""

import os
import socket
import sys
import threading


def main() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])

    def up() -> None:
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while data := sock.recv(65536):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


if __name__ == "__main__":
    main()
