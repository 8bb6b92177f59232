"""Loaded by Python at start-up when this folder is on PYTHONPATH (see transport.shim_env).

When TL2K210_LINES_SOCKET names an emulated board's unix datagram socket, pyserial's POSIX DTR/RTS
setters send ``b"dtr 1"`` / ``b"rts 0"`` there instead of calling ioctls, which a pty rejects.
The client program (e.g. kflash) runs unmodified.
"""
import os

_path = os.environ.get("TL2K210_LINES_SOCKET")
if _path:
    try:
        import socket

        import serial.serialposix as _sp

        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

        def _send(line, value):
            try:
                _sock.sendto(b"%s %d" % (line, 1 if value else 0), _path)
            except OSError:
                pass

        def _update_dtr_state(self):
            _send(b"dtr", self._dtr_state)

        def _update_rts_state(self):
            _send(b"rts", self._rts_state)

        _sp.Serial._update_dtr_state = _update_dtr_state
        _sp.Serial._update_rts_state = _update_rts_state
    except Exception:  # never break the interpreter start-up
        pass
