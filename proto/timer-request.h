/* torch's file-timer request declared once (torch.distributed.elastic.timer.FileTimerClient; the
 * agent's side is agent/filetimer.h): one JSON object a line that any process of the job may
 * write into the agent's pipe, read by record.h. */
#ifndef DL_PROTO_TIMER_REQUEST_H
#define DL_PROTO_TIMER_REQUEST_H

#include "record.h"

typedef struct {
    long long pid;
    char *scope_id;
    double expiration_time; /* seconds since the epoch; < 0 releases (pid, scope_id) */
    long long signal;
} dl_proto_timer_request_t;

/* Every field required; "version" and others are not read. */
extern const dl_proto_rec_type_t dl_proto_timer_request_type;

#endif
