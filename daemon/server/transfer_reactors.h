// TransferService's lasting calls as callback reactors, none holding a thread while it
// waits: Watch and Notifications streams (watch_reactor.cc, notify_reactor.cc) wake on
// the scheduler's and the notification log's listeners and a shared timer; the waits of
// Wait and Cancel (wait_reactor.cc) wake on a transfer's
// end (waiting_reactor.h).
// Each relays to the node a call belongs to with gRPC's callback client.
#ifndef GPUMOVE_DAEMON_SERVER_TRANSFER_REACTORS_H_
#define GPUMOVE_DAEMON_SERVER_TRANSFER_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "daemon/server/transfer_service.h"

namespace gpumove {

grpc::ServerWriteReactor<v1::TransferEvent>* ServeWatch(TransferServiceImpl* service,
                                                        grpc::CallbackServerContext* context,
                                                        const v1::WatchRequest* request);
grpc::ServerWriteReactor<v1::Notification>* ServeNotifications(
    TransferServiceImpl* service, grpc::CallbackServerContext* context,
    const v1::NotificationsRequest* request);
grpc::ServerUnaryReactor* ServeWait(TransferServiceImpl* service,
                                    grpc::CallbackServerContext* context,
                                    const v1::WaitRequest* request, v1::Transfer* response);
grpc::ServerUnaryReactor* ServeCancel(TransferServiceImpl* service,
                                      grpc::CallbackServerContext* context,
                                      const v1::CancelRequest* request, v1::Transfer* response);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_TRANSFER_REACTORS_H_
