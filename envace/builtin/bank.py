"""A small deterministic, stateful bank: the built-in real environment.

Each public method is a tool (typed, with a Google-style docstring, so its JSON schema is derived automatically).
Errors are raised as ``ValueError`` with a specific message; ``RealEnvironment`` turns them into observations.
"""

from __future__ import annotations


class Bank:
    """Accounts with integer balances and a flat fee on withdrawals and transfers.

    Attributes:
        balances: current balance of each account.
        fee: fee charged to the source account of every withdrawal and transfer.
    """

    def __init__(self, balances: dict[str, int], fee: int = 0) -> None:
        """Open the bank.

        Args:
            balances: initial balance of each account (copied, never mutated).
            fee: fee charged to the source account of every withdrawal and transfer.
        """
        self.balances = dict(balances)
        self.fee = fee

    def get_balance(self, account: str) -> dict:
        """Get the current balance of an account.

        Args:
            account: The account id, for example "A1".

        Returns:
            The account id and its balance.
        """
        return {"account": account, "balance": self._balance(account)}

    def deposit(self, account: str, amount: int) -> dict:
        """Deposit money into an account (no fee).

        Args:
            account: The account id, for example "A1".
            amount: The positive amount to deposit.

        Returns:
            The account id and its new balance.
        """
        amount = _positive(amount)
        self.balances[account] = self._balance(account) + amount
        return {"account": account, "balance": self.balances[account]}

    def withdraw(self, account: str, amount: int) -> dict:
        """Withdraw money from an account; the fee is charged on top of the amount.

        Args:
            account: The account id, for example "A1".
            amount: The positive amount to withdraw.

        Returns:
            The account id, its new balance and the fee charged.
        """
        self._debit(account, _positive(amount))
        return {"account": account, "balance": self.balances[account], "fee": self.fee}

    def transfer(self, source: str, target: str, amount: int) -> dict:
        """Transfer money between two accounts; the fee is charged to the source on top of the amount.

        Args:
            source: The account id to take the money from.
            target: The account id to credit.
            amount: The positive amount to transfer.

        Returns:
            The source account id, its new balance, the target account id, the amount transferred and the fee.
        """
        amount = _positive(amount)
        if source == target:
            raise ValueError(f"source and target must differ, got '{source}' twice")
        target_balance = self._balance(target)
        self._debit(source, amount)
        self.balances[target] = target_balance + amount
        return {"source": source, "balance": self.balances[source], "target": target, "amount": amount, "fee": self.fee}

    def _balance(self, account: str) -> int:
        if account not in self.balances:
            raise ValueError(f"unknown account '{account}'")
        return self.balances[account]

    def _debit(self, account: str, amount: int) -> None:
        balance = self._balance(account)
        requested = amount + self.fee
        if requested > balance:
            raise ValueError(f"insufficient funds in '{account}': balance {balance}, requested {requested}")
        self.balances[account] = balance - requested


def _positive(amount: int) -> int:
    """``amount`` as an int (an integral float such as ``5.0`` is accepted), which must be positive."""
    if isinstance(amount, bool) or not isinstance(amount, int | float) or int(amount) != amount:
        raise ValueError(f"amount must be an integer, got {amount!r}")
    if amount <= 0:
        raise ValueError(f"amount must be positive, got {amount!r}")
    return int(amount)
