// BufferService's byte streams as callback reactors (no thread each): Read writes a chunk
// each time the last one went, Write copies a message each time one came, on gRPC's
// callback threads (a bounded copy of at most 4 MiB, or the message's size); both relay
// to the node that owns the buffer when it is another.
#ifndef GPUMOVE_DAEMON_SERVER_READ_WRITE_REACTORS_H_
#define GPUMOVE_DAEMON_SERVER_READ_WRITE_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "daemon/server/buffer_service.h"

namespace gpumove {

grpc::ServerWriteReactor<v1::ReadResponse>* ServeRead(BufferServiceImpl* service,
                                                      grpc::CallbackServerContext* context,
                                                      const v1::ReadRequest* request);
grpc::ServerReadReactor<v1::WriteRequest>* ServeWrite(BufferServiceImpl* service,
                                                      grpc::CallbackServerContext* context,
                                                      v1::WriteResponse* response);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_READ_WRITE_REACTORS_H_
