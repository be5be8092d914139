/* Looking a variable up in an environment list that is not necessarily the process's own: the
 * agent and the config loader take theirs as a parameter, so tests can hand in any. */
#include <string.h>

#include "config.h"

const char *dl_env_get(char *const *envp, const char *name)
{
    size_t len = strlen(name);

    for (; envp != NULL && *envp != NULL; envp++)
        if (strncmp(*envp, name, len) == 0 && (*envp)[len] == '=')
            return *envp + len + 1;
    return NULL;
}
