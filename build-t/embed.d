build-t/embed.o: src/embed.c src/host.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h src/sbx.h /usr/include/lua5.4/lualib.h
src/host.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
src/sbx.h:
/usr/include/lua5.4/lualib.h:
