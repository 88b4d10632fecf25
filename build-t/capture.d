build-t/capture.o: src/capture.c src/capture.h
src/capture.h:
