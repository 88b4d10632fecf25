build-t/demux.o: src/demux.c src/demux.h
src/demux.h:
