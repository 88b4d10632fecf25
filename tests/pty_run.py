"""Runs a command string as the SSM agent does (shlex split, exec without a
shell, on a fresh PTY) and prints everything the PTY gave back. Then come
pairs FILE MARKER: the bytes of each file are written once the output
contains its marker, in order (the secret line after the ready marker,
stdin after the stdin marker)."""
import os, pty, shlex, sys

argv = shlex.split(sys.argv[1])
steps = [(open(sys.argv[i], "rb").read(), sys.argv[i + 1].encode()) for i in range(2, len(sys.argv) - 1, 2)]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
out = b""
pos = 0  # each marker is looked for after the previous one
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
    while steps and out.find(steps[0][1], pos) >= 0:
        data, marker = steps.pop(0)
        pos = out.find(marker, pos) + len(marker)
        os.write(fd, data)
os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
