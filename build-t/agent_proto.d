build-t/agent_proto.o: src/agent_proto.c src/agent_proto.h src/sha256.h
src/agent_proto.h:
src/sha256.h:
