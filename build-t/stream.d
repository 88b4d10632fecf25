build-t/stream.o: src/stream.c src/host.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h src/capture.h src/demux.h src/hijack.h
src/host.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
src/capture.h:
src/demux.h:
src/hijack.h:
