/*
** The sbx agent protocol: the contract between sbx (the host) and
** sbx-agent (one small static program per box, started once, speaking over
** one byte channel: an attached Docker exec's pipes, an SSM session's PTY,
** a local pipe). This header is the one place it is written down; the codec
** (agent_proto.c) is pure: no I/O, no loop, no Lua, so the agent, the host
** and the fuzzer share it.
**
** Frames, in both directions:
**
**   u8 type | u8 flags | u32 id | u32 len | payload[len] | [tag[16]]
**
** integers big-endian; len <= SBX_AP_MAX_PAYLOAD. id names a job (a
** command), a file transfer or 0 for the channel. When the channel is
** authenticated (a PTY, where another process in the box could write into
** it), every frame carries tag = HMAC-SHA256(key, seq || header || payload)
** cut to 16 bytes; seq is a u64 counting that direction's frames from 0, so
** a frame cannot be replayed, dropped or reordered unnoticed. The key is 32
** random bytes the host sends before the first frame (see below).
**
** Start: the host starts the agent with the channel as its stdin/stdout.
** The agent puts a terminal channel in raw mode, makes itself undumpable
** (no /proc/<pid>/mem, fd or ptrace access for other processes of its
** user), reads a 1-byte mode and the 32-byte per-box key (it authenticates
** a later attach, and for MAC every frame), then sends HELLO: VERSION, PID,
** ARCH fields. The mode is SBX_AP_MODE_PLAIN ('P') or SBX_AP_MODE_MAC
** ('M'); in lower case ('p', 'm') the agent runs beside the channel's
** process instead of as it: it forks, the agent goes on in a new session and
** the process on the channel only relays bytes, so a backend that kills the
** channel's process when the channel ends (an ECS Exec session does) leaves
** the agent and its commands running. The host answers HELLO: VERSION,
** WINDOW (bytes per stream), and for a channel that may come back GRACE
** (seconds the agent keeps its commands once the channel ends) and ACK
** (bytes between acknowledgements). A version the other side does not
** speak is an ERROR frame and the end of the channel.
**
** Re-attach (GRACE > 0): the agent listens on an abstract unix socket named
** by sbx_ap_attach_name(key), for processes of its own uid. When the channel
** ends, the agent keeps its commands (their output waits in its queue, then
** in their pipes) and waits GRACE seconds for the host; then it ends every
** command and exits. The host comes back through a fresh relay (the agent
** binary placed anew, run as "sbx-agent attach NAME"), and the two prove
** the key to each other before any frame:
**
**   agent: "SBXA" nonce_a[16]
**   host:  nonce_h[16] proof("host")[32] host_rx[8]
**   agent: proof("agent")[32] agent_rx[8]
**
** every field in lower-case hex (so twice as many bytes), rx as u64.
**
** proof(role) = HMAC-SHA256(key, role || nonce_a || nonce_h); rx is the
** count of bytes of whole frames that side has taken from the other, across
** channels. Each side then sends again, verbatim (tags and sequence numbers
** as first sent), every frame from the other's rx on: nothing is lost or
** doubled, and a command never notices the drop. To bound what each keeps,
** both acknowledge: ACK (host) and AGENT_ACK (agent) carry the sender's rx
** as u64, every ACK bytes and after a PING; what the other side has
** acknowledged is dropped. A wrong proof ends that connection; the agent
** stays detached. A second authenticated attach replaces the first.
**
** Padding: zero bytes between frames are skipped (no frame type is 0).
** On a PTY (MAC mode) the agent ends every burst it writes with three of
** them when its last bytes are not ASCII: the SSM agent holds back output
** whose last three bytes hold an invalid or incomplete UTF-8 sequence until
** more output comes (amazon-ssm-agent, agent/session/shell/shell.go,
** processStdoutData), and a frame's last bytes are a random tag. For the
** same reason the attach handshake is hex, not binary.
**
** Payload encodings: a sequence of fields, each u8 tag | u32 len | bytes.
** Integers in fields are big-endian of the field's length (1, 2, 4 or 8).
**
** Host to agent:
**   SPAWN id    ARGV* ENV* [CWD] [USER] [FLAGS u32: STDIN_PIPE, BACKGROUND,
**               SOCK_OUTPUT]
**               start a command (a new session, no channel fds, under a
**               per-job subreaper)
**   STDIN id    bytes         to the command's stdin
**   STDIN_EOF id              closes it
**   SIGNAL id   u8 signal, u8 scope (0 the command, 1 its whole tree:
**               stopped first, then signalled: nothing escapes, no next step
**               of a script runs)
**   CREDIT id   u8 stream, u32 bytes: the host read this much more of that
**               stream; the agent sends at most `window` unread bytes per
**               stream, then stops reading the command's pipe (the command
**               blocks: back-pressure instead of host memory)
**   FORGET id                 the host is done with a finished job
**   READ_FILE id  PATH [MODE]  a job whose process (no exec: the image needs
**                 no cat) writes the file's bytes to its stdout; the host
**                 stops it past its limit (a FIFO, /dev/zero)
**   WRITE_FILE id PATH, MODE u32, FLAGS (MKDIRS): a job whose process writes
**                 its stdin (STDIN frames, STDIN_EOF) to the file; exit
**                 status 0, or an errno with a message on stderr
**   PING id     bytes          answered with PONG and the same bytes (with
**               GRACE and the attach socket open, AGENT_ACK first: the host
**               pings after its HELLO and so knows the agent can be found
**               again before any command)
**   ACK 0       u64 host_rx: the host has these bytes; the agent drops them
**
** Agent to host:
**   STARTED id  u32 pid
**   OUT id      u8 stream (1 stdout, 2 stderr), bytes
**   EOF id      u8 stream
**   EXIT id     i32 status: >= 0 an exit code, < 0 the negated signal
**   DONE id     the job's supervisor is gone (its whole tree ended)
**   KILLED id   u32 processes signalled
**   CREDIT id   u8 0, u32 bytes: that much stdin reached the command; the
**               host keeps at most `window` stdin bytes unacknowledged
**   ERROR id    string code, string message (id 0: the channel); for a
**               command that could not start, code "exec_failed" and
**               string stage ("cwd", "user", "exec", "stdio"): the step
**               that failed, message its reason; nothing else follows
**               for that id (v3)
**   PONG id     bytes
**   AGENT_ACK 0 u64 agent_rx: the agent has these bytes
*/
#ifndef SBX_AGENT_PROTO_H
#define SBX_AGENT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define SBX_AP_VERSION 3
#define SBX_AP_HEADER 10
#define SBX_AP_TAG 16
#define SBX_AP_KEY 32
#define SBX_AP_MAX_PAYLOAD (1u << 20)

#define SBX_AP_MODE_PLAIN 'P'
#define SBX_AP_MODE_MAC 'M'
#define SBX_AP_MODE_RELAY 0x20 /* the lower-case bit: 'p', 'm' */

#define SBX_AP_NONCE 16
#define SBX_AP_PROOF 32
#define SBX_AP_ATTACH_HELLO "SBXA"
/* "sbx-agent --say-raw ...": once the agent (or the relay) has put a
** terminal on stdin in raw mode it writes this line, and only then reads:
** where the loader could not make the PTY raw itself (no stty), the host
** sends nothing more until it sees it. */
#define SBX_AP_SAY_RAW "--say-raw"
/* "sbx-agent --escape ...": the relay (relay modes and attach) escapes what
** it writes to the channel (pty_escape.h), for a channel through the SSM
** agent, which rewrites EF BF BD. */
#define SBX_AP_ESCAPE "--escape"
#define SBX_AP_RAW_LINE "__SBXAGENT_raw__\n"
/* Seconds the agent gives a connection to prove the key. */
#define SBX_AP_ATTACH_AUTH_SECONDS 10
/* The attach socket's name: "sbx-agent-" and 32 hex digits, NUL-ended. */
#define SBX_AP_ATTACH_NAME 43

enum sbx_ap_type {
  SBX_AP_PAD = 0x00, /* sbx_ap_decode's result for padding bytes */
  /* host to agent */
  SBX_AP_HELLO = 0x01,
  SBX_AP_SPAWN = 0x10,
  SBX_AP_STDIN = 0x11,
  SBX_AP_STDIN_EOF = 0x12,
  SBX_AP_SIGNAL = 0x13,
  SBX_AP_CREDIT = 0x14,
  SBX_AP_FORGET = 0x15,
  SBX_AP_READ_FILE = 0x20,
  SBX_AP_WRITE_FILE = 0x21,
  SBX_AP_PING = 0x30,
  SBX_AP_ACK = 0x31,
  /* agent to host */
  SBX_AP_STARTED = 0x90,
  SBX_AP_OUT = 0x91,
  SBX_AP_EOF = 0x92,
  SBX_AP_EXIT = 0x93,
  SBX_AP_DONE = 0x94,
  SBX_AP_KILLED = 0x95,
  /* 0x96 was MARK (sessions' status lines); sessions are separate commands now */
  SBX_AP_ERROR = 0xA3,
  SBX_AP_PONG = 0xB1,
  SBX_AP_AGENT_ACK = 0xB2,
};

/* Field tags. */
enum sbx_ap_field {
  SBX_AF_ARGV = 1,
  SBX_AF_ENV = 2,
  SBX_AF_CWD = 3,
  SBX_AF_USER = 4,
  SBX_AF_FLAGS = 5,
  SBX_AF_PATH = 6,
  SBX_AF_MAX = 7,
  SBX_AF_MODE = 8,
  SBX_AF_CODE = 9,
  SBX_AF_MESSAGE = 10,
  SBX_AF_VERSION = 11,
  SBX_AF_PID = 12,
  SBX_AF_ARCH = 13,
  SBX_AF_WINDOW = 14,
  SBX_AF_GRACE = 15,
  SBX_AF_ACK = 16,
  SBX_AF_STAGE = 17,
};

/* SPAWN flags. */
#define SBX_AP_STDIN_PIPE 1u
#define SBX_AP_BACKGROUND 2u
/* 4u was SESSION (retired) */
/* The command's stdout and stderr are sockets, not pipes: no other process
** can open them through /proc/PID/fd (a socket cannot be opened there), so
** no earlier command writes into this one's output. */
#define SBX_AP_SOCK_OUTPUT 8u
/* WRITE_FILE flags. */
#define SBX_AP_MKDIRS 1u

struct sbx_ap_frame {
  uint8_t type;
  uint8_t flags;
  uint32_t id;
  uint32_t len;
  const uint8_t *payload; /* points into the caller's buffer */
};

/* Results of sbx_ap_decode. */
enum {
  SBX_AP_NEED = 0,        /* not a whole frame yet */
  SBX_AP_BAD_LENGTH = -1, /* len above SBX_AP_MAX_PAYLOAD */
  SBX_AP_BAD_TAG = -2,    /* authentication failed */
};

/*
** Decodes one frame from buf[0..n). Returns the bytes it used (> 0) and
** fills f (type SBX_AP_PAD for a run of padding: no frame, no sequence
** number), SBX_AP_NEED when more bytes are needed, or a negative error.
** With key non-NULL the frame must carry a valid tag for sequence number
** seq (the caller counts). Never reads past n; never allocates.
*/
int sbx_ap_decode(const uint8_t *buf, size_t n, const uint8_t *key, uint64_t seq, struct sbx_ap_frame *f);

/*
** Writes a frame header for (type, id, len) into out[SBX_AP_HEADER]. The
** payload follows it; then, with a key, sbx_ap_tag over both.
*/
void sbx_ap_header(uint8_t *out, uint8_t type, uint32_t id, uint32_t len);

/* tag[16] = HMAC-SHA256(key, seq || header || payload)[0..16] */
void sbx_ap_tag(const uint8_t *key, uint64_t seq, const uint8_t *header, const uint8_t *payload, uint32_t len,
                uint8_t *tag);

/* The attach socket's abstract name for key (without the leading NUL). */
void sbx_ap_attach_name(const uint8_t *key, char out[SBX_AP_ATTACH_NAME]);

/* proof = HMAC-SHA256(key, role || nonce_a || nonce_h); role "host" or
** "agent". */
void sbx_ap_attach_proof(const uint8_t *key, const char *role, const uint8_t *nonce_a, const uint8_t *nonce_h,
                         uint8_t proof[SBX_AP_PROOF]);

/* 1 when a and b (n bytes) are equal, in time that does not depend on
** where they differ. */
int sbx_ap_same(const uint8_t *a, const uint8_t *b, size_t n);

/* Field reader over a payload: sbx_ap_next -> 1 with tag/value, 0 at the
** end, -1 on a malformed field (a length past the end). */
struct sbx_ap_fields {
  const uint8_t *p, *end;
};
void sbx_ap_fields_init(struct sbx_ap_fields *it, const uint8_t *payload, uint32_t len);
int sbx_ap_next(struct sbx_ap_fields *it, uint8_t *tag, const uint8_t **value, uint32_t *len);

/* Appends a field to out (capacity cap, used *n); 0, or -1 when it would
** not fit. */
int sbx_ap_put(uint8_t *out, size_t cap, size_t *n, uint8_t tag, const void *value, uint32_t len);
int sbx_ap_put_u32(uint8_t *out, size_t cap, size_t *n, uint8_t tag, uint32_t v);
int sbx_ap_put_u64(uint8_t *out, size_t cap, size_t *n, uint8_t tag, uint64_t v);

uint32_t sbx_ap_be32(const uint8_t *p);
uint64_t sbx_ap_be64(const uint8_t *p);
void sbx_ap_put_be32(uint8_t *p, uint32_t v);
void sbx_ap_put_be64(uint8_t *p, uint64_t v);
/* A field value as an integer of its length (1, 2, 4 or 8 bytes); -1 when
** the length is none of these. */
int sbx_ap_uint(const uint8_t *v, uint32_t len, uint64_t *out);

#endif
