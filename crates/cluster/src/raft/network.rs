//! Raft's messages over the cluster RPC: each is a call to `/raft/...` on the target node, answered with
//! the target Raft's `Result`.

use super::{NodeId, TypeConfig};
use crate::rpc::{RpcClient, RpcError};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub const PATH_APPEND: &str = "/raft/append";
pub const PATH_VOTE: &str = "/raft/vote";
pub const PATH_SNAPSHOT: &str = "/raft/snapshot";

pub struct Network {
    pub client: RpcClient,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        Connection { client: self.client.clone(), target, addr: node.addr.clone() }
    }
}

pub struct Connection {
    client: RpcClient,
    target: NodeId,
    addr: String,
}

impl Connection {
    async fn send<Q, A, E>(
        &self,
        path: &str,
        request: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<A, RaftError<NodeId, E>> =
            self.client.call(&self.addr, path, request, option.hard_ttl()).await.map_err(|e| match e {
                // A node that does not answer is Unreachable: openraft backs off instead of retrying at once.
                RpcError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&AnyError::error(e))),
                other => RPCError::Network(NetworkError::new(&AnyError::error(other))),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(PATH_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.send(PATH_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(PATH_VOTE, &rpc, &option).await
    }
}
