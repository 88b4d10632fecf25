build-t/agent_lua.o: src/agent_lua.c src/host.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h src/agent_proto.h
src/host.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
src/agent_proto.h:
