# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A TCP port free on this machine, for a launcher's --master_port."""

import socket


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
