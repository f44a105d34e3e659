// gpumove.v1.TransferService over the transfer scheduler.
#ifndef GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_

#include "daemon/core/transfer_scheduler.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

class TransferServiceImpl final : public v1::TransferService::Service {
 public:
  explicit TransferServiceImpl(TransferScheduler* scheduler) : scheduler_(scheduler) {}

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetTransferRequest* request,
                   v1::Transfer* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListTransfersRequest* request,
                    v1::ListTransfersResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::Transfer* response) override;
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::TransferEvent>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::Transfer* response) override;

 private:
  TransferScheduler* const scheduler_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_TRANSFER_SERVICE_H_
