"""What comes in from the agents: the websocket front (protocol v2 on its own event loop, v1
over Socket.IO), admission (token, protocol, identity), limits and the failed-attempt guard,
the pipeline that stores each batch once and folds it into the live state, and the live
findings books that judge it. Downstream of the wire (pgdash_agent.wire), upstream of web/."""
