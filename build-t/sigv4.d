build-t/sigv4.o: src/sigv4.c src/sigv4.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h
src/sigv4.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
