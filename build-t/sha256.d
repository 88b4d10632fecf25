build-t/sha256.o: src/sha256.c src/sha256.h
src/sha256.h:
