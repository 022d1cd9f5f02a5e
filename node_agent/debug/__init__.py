"""Debug sessions into this node's running jobs: the SSH server reached through the control
plane's relay, and the commands it runs in a job's environment.
Imports: node_agent.client, node_agent.models, node_agent.run, node_agent.supervisor.

asyncssh names cryptography's DSA classes in its annotations, and cryptography 51 deprecated
DSA with a warning on every such look: each agent would print five lines of them on its start
(and on its errors' stderr). This node offers no DSA key and accepts none; the warnings said
nothing to its operator, so those that asyncssh's own modules cause are not shown. Any other
module's, and every other warning of cryptography, still is.
"""

import warnings

warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
