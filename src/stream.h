/*
** What other Lua modules of the host may do with a core.stream object
** (stream.c) without a Lua string between them: the agent's frame decoder
** (agent_lua.c) takes a channel's bytes and pushes a job's output straight
** into its sink. Both act as their Lua methods do (take(true), push), so a
** stream behaves the same whichever way it is fed or drained.
*/
#ifndef SBX_STREAM_H
#define SBX_STREAM_H

#include <lua.h>
#include <stddef.h>

/*
** As stream:take(true): hands over the stdout queue of the stream at idx
** (*p: malloc'd, the caller's to free; NULL when empty; *len bytes in a
** buffer of *cap), drops the stderr queue, and lets a paused reader and a
** producer in wait_room go on. 0, or -1 when idx is no open stream.
*/
int sbx_stream_take_out(lua_State *L, int idx, char **p, size_t *len, size_t *cap);

/*
** As sink:push(fd == 2 ? "stderr" : "stdout", bytes): 1 with *queued the
** chunk bytes now queued, 0 when the sink has ended, -1 when idx is no open
** sink (a socket or pipe stream is not one).
*/
int sbx_stream_push_out(lua_State *L, int idx, int fd, const char *p, size_t n, size_t *queued);

#endif
