/* Group functions used by the collective algorithms (progress thread only). */
#ifndef PD_GROUP_INTERNAL_H
#define PD_GROUP_INTERNAL_H

#include "group.h"

/* Drive the transport once (up to the deadline, at most ~100 ms), complete
 * finished point-to-point work, and fail with PD_ETIMEOUT past deadline. */
pd_status pd_group_progress_until(pd_group *g, double deadline);

#endif
