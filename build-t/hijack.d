build-t/hijack.o: src/hijack.c src/hijack.h
src/hijack.h:
