/* TCPStore / FileStore / HashStore types: filled in by the store work. */
#include "binding.h"

int
pd_store_add_types(PyObject *m, pd_module_state *st)
{
    (void)m;
    (void)st;
    return 0;
}
