/* ProcessGroup and Work types: filled in by the group/transport work. */
#include "binding.h"

int
pd_group_add_types(PyObject *m, pd_module_state *st)
{
    (void)m;
    (void)st;
    return 0;
}
