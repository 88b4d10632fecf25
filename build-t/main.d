build-t/main.o: src/main.c src/sbx.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h
src/sbx.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
