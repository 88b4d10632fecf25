"""Runs a command string as the SSM agent does (shlex split, exec without a
shell, on a fresh PTY) and prints everything the PTY gave back. Bytes from the
file argv[2] are written once the output contains argv[3] (a ready marker)."""
import os, pty, shlex, sys

argv = shlex.split(sys.argv[1])
data = open(sys.argv[2], "rb").read() if len(sys.argv) > 2 else b""
marker = sys.argv[3].encode() if len(sys.argv) > 3 else b""
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
out = b""
sent = not data
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
    if not sent and marker in out:
        os.write(fd, data)
        sent = True
os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
