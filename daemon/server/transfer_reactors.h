// TransferService's lasting calls as callback reactors, none holding a thread while it
// waits: Watch and Notifications streams (watch_reactor.cc, notify_reactor.cc) wake on
// the scheduler's and the notification log's listeners and a shared timer; the waits of
// Wait, and of Submit and Cancel with wait (wait_reactor.cc), wake on a transfer's end.
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

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_TRANSFER_REACTORS_H_
