build-t/ssm.o: src/ssm.c src/ssm.h /usr/include/lua5.4/lua.h \
 /usr/include/lua5.4/luaconf.h /usr/include/lua5.4/lauxlib.h \
 /usr/include/lua5.4/lua.h
src/ssm.h:
/usr/include/lua5.4/lua.h:
/usr/include/lua5.4/luaconf.h:
/usr/include/lua5.4/lauxlib.h:
/usr/include/lua5.4/lua.h:
